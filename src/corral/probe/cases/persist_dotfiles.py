from ._common import plant, planted

ID = 'persist.dotfiles'
CATEGORY = 'persistence'
DESCRIPTION = 'append to ~/.bashrc, ~/.profile, ~/.gitconfig and a pip cache; does the next run see them?'
CLAIMS = ('rule:limits.scratch',)
PATHS = ['$SCRATCH/.bashrc', '$SCRATCH/.profile', '$SCRATCH/.gitconfig', '$SCRATCH/.cache/pip/planted']
CODE = plant(PATHS)
SECOND = planted(PATHS)
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are seen
CONTAINED = 'every run starts from an empty scratch: nothing planted survives'
