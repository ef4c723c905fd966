"""Exit codes: what every `toolbus` command and each `toolbus serve` child exits with.

0 ok, 1 an error reply, 2 a usage error, 3 no reply (`status --once`: no worker online), 4
no broker, the login or the request refused by it, or the client id taken (`serve`: or
no dedup store at start-up), 5 no worker online (`call`, `tools`: the statuses say so;
nothing sent), 130 interrupted (`call`: Ctrl-C, the call cancelled at the workers), 141 stdout
closed early (`toolbus call ... | head`: quiet, as a command SIGPIPE ends reports in a
shell). Here, below both, so the command line and the supervisor (which reads its
children's) take them from one place.
"""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_REPLY, EXIT_BROKER = 0, 1, 2, 3, 4
EXIT_NO_WORKER = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
EXIT_PIPE = 141  # 128 + SIGPIPE
