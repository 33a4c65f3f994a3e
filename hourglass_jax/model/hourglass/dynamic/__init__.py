"""Learned shortening: segment ops, the boundary predictors, the level's modules, its body level and cache."""
