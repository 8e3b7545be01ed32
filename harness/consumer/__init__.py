"""`kvconform consumer-check`: a KV-event consumer checked against the engine
(specs/FOREIGN_BACKEND.md, "KV-event consumers")."""
