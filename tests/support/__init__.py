"""What the tests share: a virtual clock, a decision builder, HTTP and stack helpers.

Test modules import from here (and get fixtures from conftest.py), never from each other.
"""
