module github.com/kvroute/kvroute

go 1.27

require github.com/cespare/xxhash/v2 v2.3.0
