"""How a seed and an index (prompt, sample, step, epoch) become one seed: `seed * SEED_MIX + index`.

Its own module so that every stage can import it without importing the configuration."""

# A prime above any index used, so distinct (seed, index) pairs give distinct seeds.
SEED_MIX = 1_000_003
