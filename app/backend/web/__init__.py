"""Web access to the panel: the login and sessions (`auth`), the HTTP gate in front of every route (`gate`:
Host, Origin, sizes, CSP) and files handed to the browser (`exports`). docs/ui-and-safety.md."""
