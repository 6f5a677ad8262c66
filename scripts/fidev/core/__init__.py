"""Failures and exit statuses, files, versions, the manifest, the package index, the workspace's paths."""

from fidev.core import shown

shown.show_bytes_readably()  # every message of every task, whichever module prints it
