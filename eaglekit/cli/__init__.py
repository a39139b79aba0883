"""The eaglekit command line: parse, call the library, render."""
