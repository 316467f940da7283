"""``repromatrix bisect``: the versions to search, the search, the cells it runs, the answer."""
