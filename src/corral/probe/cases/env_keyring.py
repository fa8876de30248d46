ID = 'env.keyring'
CATEGORY = 'env-leak'
DESCRIPTION = 'reach the kernel keyring (keyctl), which is not namespaced'
CLAIMS = ('kernel_surface_filtered',)
CODE = r"""
judge_syscall("keyctl", 0, -4, 0)   # KEYCTL_GET_KEYRING_ID of the user keyring, no create
"""
CONTROL = 'host'
CONTAINED = 'keyctl fails with EPERM or ENOSYS'
