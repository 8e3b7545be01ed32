"""The command line: kvconform's parser and verbs (main.py), what every verb
shares (support.py), and the verb groups of capture, peer and matrix."""
