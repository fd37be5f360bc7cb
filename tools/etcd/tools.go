//go:build tools

// Package tools pins etcd. etcd's own go.mod has replace directives, so
// `go install go.etcd.io/etcd/server/v3@...` fails; a consumer module works.
package tools

import _ "go.etcd.io/etcd/server/v3"
