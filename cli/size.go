package cli

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes parseSize reads, as nats-server's configuration does
// (max_file_store: 10G): K, M, G, T are powers of 1024, with or without B or iB.
var sizeUnits = []struct {
	suffix string
	factor int64
}{
	{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
	{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10},
	{"B", 1},
}

// parseSize reads a byte size such as 512M, 10GiB or 1048576; "" and "0" are 0.
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if t == "" {
		return 0, nil
	}
	factor := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, factor = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/factor {
		return 0, fmt.Errorf("%q is not a size like 512M, 10G or 1048576", s)
	}
	return n * factor, nil
}
