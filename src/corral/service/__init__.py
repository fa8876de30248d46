"""`corral serve`: the HTTP service (app.py), its bearer tokens (tokens.py), the ceiling a
token's sandboxes cannot exceed (ceiling.py), per-token rates and limits (limits.py), the
server's config file and secrets (config.py), the error statuses of its OpenAPI document
(openapi.py), and the MCP tools (mcp.py) on stdio and over streamable HTTP (mcp_http.py).
A face: nothing here is imported on `corral run`'s path, and the third-party pieces
(fastapi, uvicorn, mcp) are imported only by the modules that need them."""
