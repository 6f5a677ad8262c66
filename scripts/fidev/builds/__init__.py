"""Building modules: smoke's module set, the ninja builds, the build stamp."""
