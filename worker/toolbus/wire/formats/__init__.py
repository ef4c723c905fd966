"""Formats: the providers' shapes, in and out.

What the Anthropic, OpenAI (Chat Completions and Responses) and Ollama SDKs send us and
what they take back, beside our own envelope and reply. The SDKs themselves are never
imported here: the shapes are plain JSON, and the tests judge them with the SDKs' types.

incoming     provider-shaped tool calls (a block, a message, a whole response) -> our calls
envelope     our own envelope, and the options every shape carries
outgoing     our per-call replies -> what the integrator appends to the conversation
definitions  our tool list -> tool definitions in a provider's shape
names        canonical tool names as the providers' name rules allow them
"""
