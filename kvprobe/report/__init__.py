"""Renderings of a run: terminal tables, Markdown, HTML with plots."""
