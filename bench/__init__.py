"""Benchmarks (not tests): each module runs as a script and prints its figures; the tests
import the pieces they share (the reference server, the accuracy replays) from here."""
