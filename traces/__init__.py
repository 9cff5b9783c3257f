"""Bundled sample traces (package data of ``retime.traces``; see README.md here)."""
