"""Samplers, epoch and seed logic."""
