"""The API gateway: the only way to the model from other machines (issue 31, docs/gateway.md).

`keys` (hashed API keys, usage per key, the activity log; one SQLite file 0600), `readiness` (is the
engine ready, and why not), `proxy` (the ASGI app), `server` (uvicorn, the bind rule), `service` (the
panel's switch), `snippets` (client code for the Access tab).
"""
