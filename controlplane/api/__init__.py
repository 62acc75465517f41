"""HTTP plumbing shared by every route module: routing, parsing, middlewares, OpenAPI."""
