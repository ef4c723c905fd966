"""The seeds' files, their scenarios as the seeds write them, and the index that lists them.

A spec seed lists `#### Scenario: TITLE`. The proposal (002), the ADR (003) and the
mapping document (004) have no such lines: `DOCUMENT_RULES` says which of their parts are
taken as scenarios, and how each title is read from the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
SEEDS_DIR = ROOT.parent / "shared" / "seeds"  # beside the clone; absent in some checkouts
INDEX = Path(__file__).parent / "README.md"

S000 = "000_a217e9feb91caaff.txt"  # tool-execution spec delta: parameter normalization
S001 = "001_a4be83c33a199967.txt"  # tool-execution spec: executor, registry, MCP, retries
S002 = "002_4b93545e54e35234.txt"  # proposal fix-mcp-tool-parameter-schema
S003 = "003_e5d418c29df57bf1.txt"  # ADR 0139: tool naming normalization, per-caller filtering
S004 = "004_80f8cea26bef6723.txt"  # parameter mapping document (the analysis context)

_SCENARIO = re.compile(r"^#### Scenario:\s*(.+?)\s*$")


def _section(text: str, heading: str) -> list[str]:
    """The lines under `heading` (a whole line), up to the next heading of its level or above."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    out: list[str] = []
    for line in lines[start:]:
        hashes = len(line) - len(line.lstrip("#"))
        if line.startswith("#") and hashes <= level:
            break
        out.append(line)
    return out


def _success_criteria(text: str) -> list[str]:
    """002: each numbered success criterion, its words before the colon (past the tick mark,
    which the file carries as mojibake)."""
    found = []
    for line in _section(text, "## Success Criteria"):
        match = re.match(r"^\d+\.\s+\S+\s+([^:]+)", line)
        if match:
            found.append(match.group(1).strip())
    return found


def _adr_decisions(text: str) -> list[str]:
    """003: the production bugs it names, the lookups its resolver handles, and the
    decision's subsections."""
    bugs = _section(text, "### Specific production bugs caused by this")
    found = [m.group(1) for line in bugs if (m := re.match(r"^\d+\.\s+\*\*(.+?)\*\*", line))]
    decision = _section(text, "## Decision")
    after = decision[decision.index("These handle:") + 1 :]
    for line in after:
        if line.startswith("- "):
            found.append(line[2:].strip())
        elif line.strip() and found and not line.startswith("- "):
            break
    found += [line[4:].strip() for line in decision if line.startswith("### ")]
    return found


def _mapping_document(text: str) -> list[str]:
    """004: the four key transformations (`a → b`), the validation rules (each bullet of
    string and array validation) and the usage example (its heading)."""
    found = []
    for line in _section(text, "### Key Transformations"):
        match = re.match(r"^\d+\.\s+\*\*(\w+)\*\*\s+(\S+)\s+\*\*(\w+)\*\*", line)
        if match:
            found.append(f"{match.group(1)} {match.group(2)} {match.group(3)}")
    for heading in ("### String Validation", "### Array Validation"):
        found += [line[2:].strip() for line in _section(text, heading) if line.startswith("- ")]
    if "### Correct External API Call" in text.splitlines():
        found.append("Correct External API Call")
    return found


DOCUMENT_RULES: dict[str, Callable[[str], list[str]]] = {
    S002: _success_criteria,
    S003: _adr_decisions,
    S004: _mapping_document,
}


def seed_titles(path: Path) -> list[str]:
    """The scenario titles of one seed file, in its order."""
    text = path.read_text(encoding="utf-8")
    rule = DOCUMENT_RULES.get(path.name)
    if rule is not None:
        return rule(text)
    return [m.group(1) for line in text.splitlines() if (m := _SCENARIO.match(line))]


@dataclass(frozen=True)
class Row:
    """One scenario of the index: its title, the seed files it is in, its test, and the
    deliberate difference (empty when toolbus does what the seed says)."""

    title: str
    files: tuple[str, ...]
    test: str  # module::function
    difference: str


def read_index(path: Path = INDEX) -> list[Row]:
    """The rows of the index table (`| title | files | test | difference |`)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or not line.startswith("| ") or "::" not in cells[2]:
            continue
        title, files, test, difference = cells
        rows.append(
            Row(
                title=title.removeprefix('"').removesuffix('"'),
                files=tuple(name.strip() for name in files.split(",")),
                test=test.strip("`"),
                difference=difference,
            )
        )
    return rows


def quoted(title: str) -> str:
    """How a test's docstring quotes a scenario's title (whitespace collapsed)."""
    return f'"{" ".join(title.split())}"'
