"""Learned shortening (shorten='dynamic'): segment ops (segments.py), the boundary predictors (predictors/), the
level's modules (level.py), its place in the body (body.py) and its decoding cache (cache.py)."""
