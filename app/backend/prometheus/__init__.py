"""The panel's own Prometheus metrics: counters the web gate and the login feed, the collector that
builds `moet_panel_*` families from the services' cached snapshots at scrape time, and the `/metrics`
route with its access rule. Series, units and sources: docs/metrics.md."""
