"""Reports: the text forms of a failure and of a run (text.py), the HTML and
markdown pages of the report verb (pages.py), the pool picture. Formats what
runs produced; runs nothing."""
