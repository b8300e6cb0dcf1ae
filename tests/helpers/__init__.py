"""What the tests share: real models written with gguf, real logs made by real runs, servers and
networks for the tests that need them. Imported as ``helpers.NAME`` (pytest puts tests/ on the path).
"""
