from ._common import write_back

ID = 'escape.core-pattern'
CATEGORY = 'escape'
DESCRIPTION = 'write /proc/sys/kernel/core_pattern (a pipe there runs as host root on a crash)'
CLAIMS = ('no_host_root',)
CODE = write_back('/proc/sys/kernel/core_pattern')
CONTROL = 'host'
CONTAINED = 'the write fails (EROFS, EACCES or EPERM); the probe writes back the current value only'
