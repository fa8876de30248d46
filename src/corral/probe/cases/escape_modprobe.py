from ._common import write_back

ID = 'escape.modprobe'
CATEGORY = 'escape'
DESCRIPTION = 'write /proc/sys/kernel/modprobe (the helper the kernel runs as root)'
CLAIMS = ('no_host_root',)
CODE = write_back('/proc/sys/kernel/modprobe')
CONTROL = 'host'
CONTAINED = 'the write fails; the probe writes back the current value only'
