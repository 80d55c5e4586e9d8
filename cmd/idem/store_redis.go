package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

func init() {
	registerBackend(backend{
		Name:    "Redis",
		Schemes: []string{"redis", "rediss"},
		Example: "redis://HOST:PORT/DB",
		Open:    openRedis,
	})
}

// redisOptions splits cfg.DSN into the client's options and the store's:
// the query parameters prefix (key prefix) and strict (refuse an evicting
// maxmemory-policy) belong to idem, the rest to rueidis.ParseURL
// (db, dial_timeout, addr for more cluster seeds, …).
func redisOptions(dsn string) (rueidis.ClientOption, idemredis.Config, error) {
	var cfg idemredis.Config
	u, err := url.Parse(dsn)
	if err != nil {
		return rueidis.ClientOption{}, cfg, fmt.Errorf("invalid --store %q: %v; want redis://[USER:PASSWORD@]HOST:PORT/DB", redactDSN(dsn), err)
	}
	q := u.Query()
	cfg.Prefix = q.Get("prefix")
	if s := q.Get("strict"); s != "" {
		if cfg.Strict, err = strconv.ParseBool(s); err != nil {
			return rueidis.ClientOption{}, cfg, fmt.Errorf("invalid --store %q: strict=%q is not a boolean", redactDSN(dsn), s)
		}
	}
	q.Del("prefix")
	q.Del("strict")
	u.RawQuery = q.Encode()
	opt, err := rueidis.ParseURL(u.String())
	if err != nil {
		return opt, cfg, fmt.Errorf("invalid --store %q: %v; want redis://[USER:PASSWORD@]HOST:PORT/DB", redactDSN(dsn), err)
	}
	// The CLI never reads through the client-side cache, and servers that
	// speak only RESP2 refuse to enable it.
	opt.DisableCache = true
	return opt, cfg, nil
}

func openRedis(ctx context.Context, cfg storeConfig) (idem.Store, func() error, error) {
	opt, scfg, err := redisOptions(cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot connect to Redis at %v: %v; check that the server is running and that --store (IDEM_STORE) is right",
			opt.InitAddress, err)
	}
	s, err := idemredis.New(ctx, client, &scfg)
	if err != nil {
		client.Close()
		if errors.Is(err, idem.ErrInvalidConfig) || errors.Is(err, idemredis.ErrEvictionPolicy) {
			return nil, nil, fmt.Errorf("invalid --store %q: %w", redactDSN(cfg.DSN), err)
		}
		return nil, nil, fmt.Errorf("cannot use Redis at %v: %w", opt.InitAddress, err)
	}
	return s, func() error { client.Close(); return nil }, nil
}
