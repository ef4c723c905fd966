"""Exit codes: what every `toolbus` command and each `toolbus serve` child exits with.

0 ok, 1 an error reply, 2 a usage error, 3 no reply, 4 no broker (`serve`: or no dedup store at
start-up). Here, below both, so the command line and the supervisor (which reads its children's)
take them from one place.
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_REPLY, EXIT_BROKER = 0, 1, 2, 3, 4
