"""The plan as others read it: a listing for people, jobs for CI systems (GitHub Actions,
Buildkite) sized to their time limits."""
