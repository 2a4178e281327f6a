"""Where the engine runs and how it is reached: the `Runtime` protocol (`base`), its Docker and local-process
implementations (`docker`, `process`) and the choice between them (`choice`); the engine's HTTP API as the panel
reads it — the client (`client`), the readiness probe (`readiness`) and the `/metrics` text parser
(`metrics_text`). Nothing here decides anything about the engine's state."""
