-- Prepended at build time to the release and renew scripts.
--
-- Compares two counters given as decimal strings, exactly (Lua numbers
-- are doubles, exact only up to 2^53): -1, 0 or 1.
local function compare_counters(a, b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then
    return 0
  end
  return a < b and -1 or 1
end
