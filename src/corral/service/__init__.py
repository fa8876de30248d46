"""`corral serve`: the HTTP service (app.py), its bearer tokens (tokens.py), the ceiling a
token's sandboxes cannot exceed (ceiling.py) and the MCP server (mcp.py). A face: nothing
here is imported on `corral run`'s path, and the third-party pieces (fastapi, uvicorn, mcp)
are imported only by the modules that need them."""
