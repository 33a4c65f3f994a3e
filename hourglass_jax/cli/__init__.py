"""Command-line entry points (main.py: hourglass-train, -eval, -data, -sample, -convert, -export) and their flags."""
