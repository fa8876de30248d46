ID = 'env.inherited-signals'
CATEGORY = 'env-leak'
DESCRIPTION = ('started by a caller under nohup (SIGINT, SIGHUP ignored; SIGUSR1, SIGUSR2 '
               'blocked): do ignored signals and the signal mask reach the command?')
CLAIMS = ('rule:env',)
NOHUP = True
# Python ignores SIGPIPE and SIGXFSZ itself at start-up: not inherited, left out. Python
# records a disposition that was SIG_IGN when it started (gVisor's /proc/self/status has no
# SigIgn line, so this is the one view every tier gives).
CODE = r"""
ignored = sorted(int(s) for s in signal.valid_signals()
                 if signal.getsignal(s) == signal.SIG_IGN and s not in (signal.SIGPIPE, signal.SIGXFSZ))
blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
if ignored or blocked:
    out("ALLOWED", f"inherited: ignored {ignored}, blocked {blocked}: Ctrl-C, SIGHUP or a "
                   "blocked SIGUSR1 do not act on the command")
else:
    out("DENIED", "every signal at its default, none blocked")
"""
CONTROL = 'host'
CONTAINED = 'the command starts with every signal at its default disposition and none blocked'
