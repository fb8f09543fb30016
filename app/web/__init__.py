"""The web page served by the API: templates, static assets and their routes."""
