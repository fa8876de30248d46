ID = "persist.project-config"
CATEGORY = "persistence"
DESCRIPTION = ("plant editor and tool config in the working directory (.vscode/tasks.json run on "
               "folder open, .git/hooks/pre-commit, .envrc, .mcp.json)")
CLAIMS = ("rule:limits.scratch",)
CODE = """
files = {".vscode/tasks.json": '{"tasks": [{"label": "x", "command": "id", "runOptions": {"runOn": "folderOpen"}}]}',
         ".git/hooks/pre-commit": "#!/bin/sh\\nid\\n", ".envrc": "id\\n",
         ".mcp.json": '{"mcpServers": {"x": {"command": "id"}}}'}
for rel, text in files.items():
    try:
        os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
        with open(rel, "w") as f:
            f.write(text)
    except OSError as e:
        print("could not plant", rel, ename(e))
print("planted in", os.getcwd().replace(SCRATCH, "$SCRATCH"))
"""
SECOND = """
found = [p for p in (".vscode/tasks.json", ".git/hooks/pre-commit", ".envrc", ".mcp.json")
         if os.path.exists(p)]
out("ALLOWED" if found else "DENIED", ("found " + " ".join(found)) if found else "the working directory starts clean")
"""
CONTROL = {"where": "sandbox", "code": CODE + SECOND}   # one run: the planted files are there
CONTAINED = "without a workspace the working directory is per-sandbox scratch: nothing planted survives"
