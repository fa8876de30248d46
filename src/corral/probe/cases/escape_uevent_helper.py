from ._common import write_back

ID = 'escape.uevent-helper'
CATEGORY = 'escape'
DESCRIPTION = 'write /sys/kernel/uevent_helper (run as root on every uevent)'
CLAIMS = ('no_host_root',)
CODE = write_back('/sys/kernel/uevent_helper')
CONTROL = 'host'
CONTAINED = '/sys is absent or read-only; the probe writes back the current value only'
