"""The HTTP front door: routes, bodies, validation, images and OpenAPI."""
