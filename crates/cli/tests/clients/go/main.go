// A go-redis (v9) client against `spindle kv serve`: go-redis speaks
// RESP3 (HELLO 3) by default and sends CLIENT SETINFO on connect.
// Usage: go run . <host:port>. Exits 1 with the first mismatch.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

func check(what string, ok bool, got interface{}) {
	if !ok {
		fmt.Fprintf(os.Stderr, "go-redis: %s: got %v\n", what, got)
		os.Exit(1)
	}
}

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Args[1], Protocol: 3, ClientName: "spindle-go-test"})
	defer rdb.Close()

	pong, err := rdb.Ping(ctx).Result()
	check("PING", err == nil && pong == "PONG", fmt.Sprint(pong, err))
	check("SET", rdb.Set(ctx, "go:a", "1", 0).Err() == nil, "error")
	v, err := rdb.Get(ctx, "go:a").Result()
	check("GET", err == nil && v == "1", fmt.Sprint(v, err))
	_, err = rdb.Get(ctx, "go:missing").Result()
	check("GET missing is redis.Nil", err == redis.Nil, err)
	n, err := rdb.IncrBy(ctx, "go:a", 41).Result()
	check("INCRBY", err == nil && n == 42, fmt.Sprint(n, err))
	check("SET EX", rdb.Set(ctx, "go:ttl", "x", 100*time.Second).Err() == nil, "error")
	ttl, err := rdb.TTL(ctx, "go:ttl").Result()
	check("TTL", err == nil && ttl > 90*time.Second && ttl <= 100*time.Second, fmt.Sprint(ttl, err))
	ok, err := rdb.SetNX(ctx, "go:a", "2", 0).Result()
	check("SETNX on an existing key", err == nil && !ok, fmt.Sprint(ok, err))
	l, err := rdb.Append(ctx, "go:a", "!").Result()
	check("APPEND", err == nil && l == 3, fmt.Sprint(l, err))
	check("MSET", rdb.MSet(ctx, "go:m1", "x", "go:m2", "y").Err() == nil, "error")
	vals, err := rdb.MGet(ctx, "go:m1", "go:m2", "go:m3").Result()
	check("MGET", err == nil && len(vals) == 3 && vals[0] == "x" && vals[1] == "y" && vals[2] == nil, fmt.Sprint(vals, err))
	keys, err := rdb.Keys(ctx, "go:m*").Result()
	sort.Strings(keys)
	check("KEYS", err == nil && len(keys) == 2 && keys[0] == "go:m1" && keys[1] == "go:m2", fmt.Sprint(keys, err))
	var scanned []string
	iter := rdb.Scan(ctx, 0, "go:*", 2).Iterator()
	for iter.Next(ctx) {
		scanned = append(scanned, iter.Val())
	}
	check("SCAN", iter.Err() == nil && len(scanned) == 4, fmt.Sprint(scanned, iter.Err()))
	pipe := rdb.Pipeline()
	incrs := make([]*redis.IntCmd, 100)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctx, "go:p")
	}
	_, err = pipe.Exec(ctx)
	check("pipeline", err == nil && incrs[99].Val() == 100, fmt.Sprint(incrs[99].Val(), err))
	d, err := rdb.Del(ctx, "go:a", "go:m1", "go:m2", "go:nope").Result()
	check("DEL of many keys", err == nil && d == 3, fmt.Sprint(d, err))
	info, err := rdb.Info(ctx, "server").Result()
	check("INFO", err == nil && len(info) > 0, fmt.Sprint(info, err))
	fmt.Println("go-redis: all checks passed")
}
