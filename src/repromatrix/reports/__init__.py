"""Stage 6: what people and CI read: table, Markdown, HTML, JUnit, JSON, diff."""
