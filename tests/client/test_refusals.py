"""What a refused request is told to check: the words name the fix, never "(none)"."""

from __future__ import annotations

from toolbus.client.refusals import refused_why


def test_topic_identity_without_a_caller_is_told_to_give_the_login() -> None:
    """A new user's `toolbus call` under topic identity with no `--caller`: the refusal
    read "the caller is (none)", like a bug; it says which `--caller` to give."""
    why = refused_why(in_topic=True, caller=None, login="kitchen")
    assert "--caller kitchen" in why and "(none)" not in why


def test_a_caller_that_is_not_the_login_names_both() -> None:
    why = refused_why(in_topic=True, caller="garage", login="kitchen")
    assert "garage" in why and "kitchen" in why


def test_a_body_caller_under_a_topic_acl_is_told_about_caller_identity() -> None:
    why = refused_why(in_topic=False, caller="kitchen", login="kitchen")
    assert "TOOLBUS_CALLER_IDENTITY=topic" in why
