"""The usage texts of `corral`'s commands (cli.py prints them with _help): kept apart so
that a run's path does not load them."""

from . import __version__

RUN_USAGE = """\
usage: corral run [--policy FILE] [--isolation T] [--image NAME] [--timeout D] [--cpu-time D]
                  [--memory SIZE] [--cpus N] [--pids N] [--scratch-size SIZE]
                  [--output-limit SIZE] [--env NAME | --env NAME=VALUE]...
                  [--workspace PATH[:ro|rw|review][:same]] [--apply | --discard]
                  [--patch FILE] [--ro-bind PATH]... [--net none|allow]
                  [--allow-domain RULE]... [--deny-domain RULE]... [--allow-private CIDR]...
                  [--nameserver ADDR]... [--upstream-ca FILE]
                  [--secret NAME=SOURCE@HOSTS[/TTL]]... [--plain-http NAME]...
                  [-t|--tty] [--stdin] [--raw] [--json] [--receipt FILE] -- CMD...

Run CMD in a sandbox: read-only root, no network unless domains are allowed through
corral's egress proxy, /scratch as HOME, nothing of the host's environment, limits on
memory, processes, CPU, time and output.

options (each overrides the policy file):
  --policy FILE          a policy in TOML (see docs/policy.md); never read from the workspace
  --isolation T          the tier: namespace (default), gvisor, process, wasm, microvm or auto
                         (docs/tiers.md; corral explain --isolation T says what each
                         enforces here)                               [isolation]
  --image NAME           the root: host (default), an image name or sha256:... [image]
  --timeout D            wall clock, e.g. 500ms, 60s, 2m          [limits.timeout]
  --cpu-time D           CPU time of the whole run                [limits.cpu_time]
  --memory SIZE          memory incl. swap, e.g. 512M, 1G         [limits.memory]
  --cpus N               CPU quota in cores, e.g. 0.5             [limits.cpus]
  --pids N               processes and threads at once            [limits.pids]
  --scratch-size SIZE    size of /scratch + /tmp + /dev/shm       [limits.scratch]
  --output-limit SIZE    bytes kept per stream                    [limits.output]
  --env NAME             pass the host variable NAME through      [env.pass]
  --env NAME=VALUE       set NAME in the sandbox                  [env.set]
  --workspace PATH[:M][:same]
                         mount PATH at /workspace (with :same at PATH itself) and work
                         there, M = ro (default), rw, or review: writable inside,
                         the writes kept apart; after CMD the changes are listed and,
                         on a terminal, offered file by file (else kept off the host)
                                                              [filesystem.workspace]
  --apply                review: copy every change to the host (conflicts and refused
                         paths are left and listed)
  --discard              review: drop the changes
  --patch FILE           review: write the changes as a git patch (git apply FILE)
  --ro-bind PATH         show host PATH read-only at the same path [filesystem.ro_binds]
  --secret NAME=SOURCE@HOST[,HOST...][/TTL]
                         a credential grant: the sandbox sees a placeholder in $NAME, the
                         egress proxy sends the value (SOURCE: env:VAR or file:PATH) to
                         these hosts only, for TTL (default 15m)    [secrets.NAME]
  --plain-http NAME      let the proxy send secret NAME over unencrypted http:// too
                         (anyone on the path can read it)   [secrets.NAME.plain_http]
  --net none|allow       network mode (default none: loopback only)  [network.mode]
  --allow-domain RULE    let the egress proxy through to RULE: host, *.suffix, IP or
                         CIDR, with an optional :port; implies --net allow [network.allow]
  --deny-domain RULE     refuse RULE even if allowed               [network.deny]
  --allow-private CIDR   let the proxy reach these private addresses [network.allow_private]
  --nameserver ADDR      resolver for the proxy, IP or IP:PORT     [network.nameservers]
  --upstream-ca FILE     CA file (PEM) the proxy checks granted hosts' TLS against,
                         instead of the host's trust store       [network.upstream_ca]
  -t, --tty              give CMD a terminal of the sandbox's own, for an interactive
                         shell (corral run -t --timeout 8h -- bash): a new pty as its
                         stdin, stdout, stderr and controlling terminal, never this one.
                         Keys (^C too) and window size are relayed; this terminal is raw
                         until CMD ends; output is shown as is (like ssh). The Result's
                         stdout keeps the first --output-limit bytes of the terminal's
                         one stream; stderr is empty. --timeout holds (default 60s).
                         Without -t, CMD's stdin is /dev/null unless --stdin
  --stdin                pass this process's stdin through (a pipe or file, never a tty)
  --raw                  show output as is (by default control characters are neutralised
                         on a terminal)
  --json                 print the Result as one JSON object instead of the output
  --receipt FILE         write a signed receipt of the run to FILE (hashes of the policy,
                         image, argv, stdin, stdout, stderr, workspace changes, egress
                         log; corral verify checks it: docs/audit.md)
  -h, --help             this help
"""

POLICY_USAGE = """\
usage: corral policy show [--policy FILE] [run options]

Print the effective policy, every default included, as TOML that --policy reads back.
Takes the same policy options as `corral run` (no command).
"""

MAIN_USAGE = f"""\
usage: corral [--version] [--help] COMMAND ...

commands:
  run      run a command in a sandbox            (corral run --help)
  shell    an interactive shell in a sandbox     (corral shell --help)
  learn    run once permissively, write the least-privilege policy (corral learn --help)
  policy   show the effective policy             (corral policy show --help)
  explain  what enforces each rule of a policy   (corral explain --help)
  doctor   what this host supports and how to fix what is missing
  probe    run the attack catalogue against each tier (corral probe --help)
  image    build, import, export and list pinned root images (corral image --help)
  install  install packages into a new image, in a sandbox (corral install --help)
  sandbox  live sandboxes: create, ls, exec, kill  (corral sandbox --help)
  batch    many jobs, here or on a Ray cluster   (corral batch --help; docs/scale.md)
  serve    the HTTP service for remote sandboxes (corral serve --help)
  token    create, list and revoke the service's bearer tokens (corral token --help)
  mcp      an MCP server on stdio for coding assistants (corral mcp --help)
  runs     what ran, from the audit store        (corral runs --help; docs/audit.md)
  logs     the events of one run                 (corral logs RUN)
  denials  what was refused, and the rule that would allow it (corral denials --help)
  gc       drop audit records older than an age  (corral gc --older-than 30d)
  audit    export the audit store as JSON lines  (corral audit export)
  verify   check a signed receipt                (corral verify --help)
  key      this host's receipt-signing key       (corral key show)

corral {__version__}
"""

SHELL_USAGE = """\
usage: corral shell [run options] [-- CMD...]

An interactive shell (bash -i, or CMD) in a fresh sandbox, on a terminal of the sandbox's
own (sb.pty: docs/sessions.md); this terminal is raw until it ends, its keys and window
size relayed. The policy options are corral run's; --timeout holds (default 60s: give
e.g. --timeout 8h). Exit status: the shell's, as corral run's.
"""

EXPLAIN_USAGE = """\
usage: corral explain [--policy FILE] [--isolation T] [run options] [--json]

For this policy on this tier on this host: does the code get its own kernel, is the
network closed by default (what can it reach, which private ranges, and the tier's network
path: how its traffic leaves), which credentials can it reach, which workspace it sees
(host path, mode, where inside); then a line per rule saying what enforces it (kernel,
proxy, supervisor, or none). It reads the
same plan `corral run` would run. Exit 0 when the policy would run, 3 when it would be
refused (the refusal is part of the output).
"""

SANDBOX_USAGE = """\
usage: corral sandbox create [run's policy options] [--timeout S] [--idle-timeout D]
                             [--command-timeout D] [--json]
       corral sandbox ls [--json]
       corral sandbox exec ID [--stdin] [--json] [--raw] [--timeout D]
                           [--env NAME=VALUE]... -- CMD...
       corral sandbox kill ID

Live sandboxes that outlive this command: `create` starts one with a supervisor process of
its own and prints its id; it runs until `kill` or its timeout (--timeout, seconds,
default 300; --idle-timeout: limits.idle_timeout; --command-timeout: each command's
limits.timeout). `exec` runs CMD in it (files in /scratch and background processes are
kept between execs) and exits with CMD's status, as `corral run` does; a policy option
given to `exec` is refused (exit 2): the sandbox's policy is the one it was created with.
"""

LEARN_USAGE = """\
usage: corral learn [run's policy options] [--out FILE] [--margin X] [--stdin] [--json]
                    -- CMD...

Run CMD once in learn mode and write the least-privilege policy that would have let that
run succeed, each rule with a comment saying which observation produced it. The learn run
keeps every host secret out (no home, no host environment, no credentials: --secret and
--env NAME are refused; a fresh /scratch) but lets the egress proxy through to every public
host at any port; deny rules, metadata names and private, loopback and link-local
addresses stay refused (--allow-private CIDR opens a range, as for corral run). A
workspace is mounted in review mode: writes are listed, never reach the host. Limits
the options do not set are raised (600s, 2G, 1024 pids) for the learn run.

  --out FILE     write the policy there (default: stdout, after the summary on stderr)
  --margin X     learned limits are the observed use times X (default 1.5; 1 to 100),
                 never below 32M of memory and 5s of wall and CPU time
  --json         one JSON object: result, observed, margin, policy, out

What is learned: the hosts and ports contacted (one allow rule each; none: network
closed), peak memory, wall and CPU time, whether the workspace was written (rw or ro), and
the syscalls the seccomp profile refused (namespace and process tiers; listed in comments:
no rule allows one). Not observed: peak pids; refused syscalls on gvisor (docs/audit.md).
Then:

  corral learn --out policy.toml -- CMD
  corral run --policy policy.toml -- CMD

Exit status: the command's, as corral run's (2: a usage or policy error).
"""

BATCH_USAGE = """\
usage: corral batch JOBS.jsonl --out RESULTS.jsonl [--policy FILE] [--ray ADDRESS]
                    [--concurrency N]

Run every job of JOBS.jsonl (one JSON object a line: {"id", "argv" | "code", "stdin",
"files", "policy"}) in sandboxes of the policy, and append one JSON line per job to
RESULTS.jsonl as each finishes: the Result's fields plus id, node, attempt, run_id and the
node's signed receipt, or id, node and the error that refused it. Run again with the same
--out to resume: jobs already there are skipped, none runs twice. Progress on a terminal.

options:
  --out FILE         where the result lines go (appended; read first to resume)
  --policy FILE      the batch's policy (TOML, docs/policy.md); a job's own "policy" may
                     only narrow it. [batch] reuse = true runs job after job in one
                     sandbox, its scratch wiped between them (default: a fresh sandbox
                     each, from a warm pool)
  --ray ADDRESS      run on a Ray cluster (ADDRESS as `ray start --head` printed it, or
                     "auto"): one actor a node, jobs only where their tier is
                     (docs/scale.md)
  --concurrency N    jobs at once: on this machine (default: its CPUs), or on each node
                     (default: the node's CPUs)

Exit status: 0 when every job ran (whatever its verdict), 1 when some job was refused or
could not be run (its line has "error"), 2 for a bad JOBS line, option or policy, 3 when
the Ray cluster cannot be reached.
"""

USAGE = {"BATCH": BATCH_USAGE, "RUN": RUN_USAGE, "LEARN": LEARN_USAGE, "POLICY": POLICY_USAGE, "MAIN": MAIN_USAGE, "SHELL": SHELL_USAGE,
         "EXPLAIN": EXPLAIN_USAGE, "SANDBOX": SANDBOX_USAGE}
