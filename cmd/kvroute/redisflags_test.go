package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/store"
)

func TestRedisFlags(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		want     store.Config
		topology string
		wantErr  string
	}{
		{name: "url", args: []string{"--redis-url", "rediss://u@r:6380/0"},
			want: store.Config{URL: "rediss://u@r:6380/0"}, topology: "single"},
		{name: "cluster seeds from env", env: map[string]string{"KVROUTE_REDIS_ADDRS": "a:1, b:2,c:3", "KVROUTE_REDIS_USERNAME": "kvr", "KVROUTE_REDIS_PASSWORD_FILE": "/run/pw"},
			want: store.Config{Addrs: []string{"a:1", "b:2", "c:3"}, Username: "kvr", PasswordFile: "/run/pw"}, topology: "cluster"},
		{name: "go-redis cluster url", args: []string{"--redis-url", "redis://a:1?addr=b:2&addr=c:3"},
			want: store.Config{URL: "redis://a:1?addr=b:2&addr=c:3"}, topology: "cluster"},
		{name: "repeated addrs", args: []string{"--redis-addrs", "a:1", "--redis-addrs", "b:2"},
			want: store.Config{Addrs: []string{"a:1", "b:2"}}, topology: "cluster"},
		{name: "one seed, cluster endpoint", args: []string{"--redis-addrs", "cfg:6379", "--redis-cluster", "--redis-tls"},
			want: store.Config{Addrs: []string{"cfg:6379"}, Cluster: true, TLS: true}, topology: "cluster"},
		{name: "sentinel", args: []string{"--redis-addrs", "s1:26379,s2:26379", "--redis-master", "mymaster"},
			want: store.Config{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster"}, topology: "sentinel"},
		{name: "tls files", args: []string{"--redis-url", "rediss://r:1", "--redis-tls-ca", "ca.pem", "--redis-tls-cert", "c.pem", "--redis-tls-key", "k.pem", "--redis-tls-server-name", "redis.internal"},
			want: store.Config{URL: "rediss://r:1", TLSCAFile: "ca.pem", TLSCertFile: "c.pem", TLSKeyFile: "k.pem", TLSServerName: "redis.internal"}, topology: "single"},
		{name: "flag wins over env", args: []string{"--redis-url", "redis://flag:1"}, env: map[string]string{"KVROUTE_REDIS_URL": "redis://env:1"},
			want: store.Config{URL: "redis://flag:1"}, topology: "single"},
		{name: "read url", args: []string{"--redis-url", "redis://p:1", "--redis-read-url", "redis://replica:1"},
			want: store.Config{URL: "redis://p:1", ReadURL: "redis://replica:1"}, topology: "single"},
		{name: "cluster read replicas from env", env: map[string]string{"KVROUTE_REDIS_ADDRS": "a:1,b:2", "KVROUTE_REDIS_READ_REPLICAS": "true"},
			want: store.Config{Addrs: []string{"a:1", "b:2"}, ReadReplicas: true}, topology: "cluster"},
		{name: "read url on a cluster", args: []string{"--redis-addrs", "a:1,b:2", "--redis-read-url", "redis://r:1"}, wantErr: "--redis-read-replicas"},
		{name: "read replicas on one server without a url", args: []string{"--redis-url", "redis://p:1", "--redis-read-replicas"}, wantErr: "--redis-read-url"},
		{name: "master without sentinels", args: []string{"--redis-master", "m"}, wantErr: "--redis-addrs"},
		{name: "cert without key", args: []string{"--redis-url", "redis://r:1", "--redis-tls-cert", "c.pem"}, wantErr: "--redis-tls-key"},
		{name: "password twice", args: []string{"--redis-url", "redis://r:1", "--redis-password", "x", "--redis-password-file", "f"}, wantErr: "give one"},
		{name: "settings without a redis", args: []string{"--redis-username", "u"}, wantErr: "without --redis-url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet()
			var got store.Config
			redisFlags(fs, &got, "url")
			err := fs.Parse(tc.args)
			if err == nil {
				err = applyEnv(fs, func(k string) string { return tc.env[k] })
			}
			if err == nil {
				err = checkRedisFlags(got)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("config = %+v, want %+v", got, tc.want)
			}
			if got.Topology() != tc.topology {
				t.Errorf("topology = %q, want %q", got.Topology(), tc.topology)
			}
		})
	}
}

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}
