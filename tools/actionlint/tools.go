//go:build tools

// Package tools pins actionlint, which checks the GitHub workflows (`make lint`).
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
