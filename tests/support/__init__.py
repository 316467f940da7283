"""What the tests share: paths, factories built on the production constructors, and data."""
