"""Command-line entry points (main.py: hourglass-train, -eval, -data, -sample, -export) and their flags."""
