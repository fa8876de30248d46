ID = 'kernel.ptrace'
CATEGORY = 'kernel'
DESCRIPTION = 'PTRACE_ATTACH to a process (its own child, the least a tracer needs)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
pid = os.fork()
if pid == 0:                 # waits until the parent kills it, however long the attach takes
    signal.pause(); os._exit(0)
try:
    judge_syscall("ptrace", 16, pid, 0, 0, cleanup=lambda r: sys_call("ptrace", 17, pid, 0, 0))
finally:
    os.kill(pid, 9); os.waitpid(pid, 0)
"""
CONTROL = 'host'
CONTAINED = 'ptrace fails with EPERM'
