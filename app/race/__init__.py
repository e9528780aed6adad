"""Race: continuous vs static. The queue on a continuous and a static lane of this tab's own, side by side and live,
on clocks that count only each lane's own steps (`batching.race`)."""
