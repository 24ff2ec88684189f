"""Demand forecasts: what each tenant is expected to send ahead of time.

What lives here: `outlook` (what the quota controller asks of a forecast: `Outlook`,
`Expected`). The per-tenant seasonal fit from the traffic record and the business calendar
produce outlooks; budget's controller consumes them. No I/O: fitting runs wherever its
caller puts it (the sidecar: a separate process, off the request path).
"""
