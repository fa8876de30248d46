ID = 'info.dmesg'
CATEGORY = 'info'
DESCRIPTION = 'read the kernel log (syslog(2) SYSLOG_ACTION_SIZE_BUFFER, /dev/kmsg)'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
judge_syscall("syslog", 10, 0, 0)
"""
CONTROL = 'host'
CONTAINED = 'syslog fails with EPERM'
