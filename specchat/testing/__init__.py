"""What tests, screenshots and lab scripts build on: tiny seeded models and scripted engines.

The top layer of the import contract: it may use every other layer, and nothing in the product
imports it.
"""
