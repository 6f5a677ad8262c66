"""Failures and exit statuses, files, versions, the manifest, the package index, the workspace's paths."""
