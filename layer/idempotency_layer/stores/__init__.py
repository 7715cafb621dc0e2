"""The storage floor: the record protocol (`protocol`) and every backend as a sibling (`dynamodb/`, `valkey/`,
`s3`), none importing another."""
