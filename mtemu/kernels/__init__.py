"""Kernel generators: programs for the emulated cluster."""
