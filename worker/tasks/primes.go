package tasks

import "context"

// segmentBytes is the sieve window: one byte per odd number, sized to stay in
// a typical 32 KiB L1 data cache, which is what makes a segmented sieve fast.
const segmentBytes = 32 << 10

// countPrimesBelow counts the primes p < n with a segmented Sieve of
// Eratosthenes over odd numbers only. Index i stands for the odd number 2i+1.
// ctx is checked once per segment, so a cancel costs at most one window.
func countPrimesBelow(ctx context.Context, n int) (int, error) {
	if n <= 2 {
		return 0, nil
	}
	// Odd numbers below n have indices [0, n/2); index 0 is 1, not a prime.
	end := n / 2
	primes := oddPrimesUpTo(isqrt(n - 1))
	next := make([]int, len(primes)) // index of each prime's next odd multiple
	for j, p := range primes {
		next[j] = (p * p) / 2
	}
	count := 1 // the prime 2
	seg := make([]byte, segmentBytes)
	active := 0 // primes[:active] have p*p inside or before the current window
	for lo := 1; lo < end; lo += segmentBytes {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		hi := min(lo+segmentBytes, end)
		w := seg[:hi-lo]
		clear(w)
		for active < len(primes) && next[active] < hi {
			active++
		}
		for j, p := range primes[:active] {
			k := next[j] - lo
			for ; k < len(w); k += p {
				w[k] = 1
			}
			next[j] = k + lo
		}
		for _, c := range w {
			count += int(c ^ 1)
		}
	}
	return count, nil
}

// oddPrimesUpTo returns the odd primes <= m with a plain sieve; m is at most
// sqrt(50 000 000) here, so this is tiny.
func oddPrimesUpTo(m int) []int {
	composite := make([]bool, m+1)
	var primes []int
	for p := 3; p <= m; p += 2 {
		if composite[p] {
			continue
		}
		primes = append(primes, p)
		for q := p * p; q <= m; q += 2 * p {
			composite[q] = true
		}
	}
	return primes
}

// isqrt returns the largest r with r*r <= x, for x >= 0.
func isqrt(x int) int {
	r := 0
	for bit := 1 << 31; bit > 0; bit >>= 1 {
		if c := r | bit; c*c <= x {
			r = c
		}
	}
	return r
}
